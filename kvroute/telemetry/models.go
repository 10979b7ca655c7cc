package telemetry

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds of a GET /v1/models answer. A server listing its base model and a few hundred LoRA
// adapters answers in tens of KB; more than this is not a model list.
const (
	// MaxModelsBytes bounds the page.
	MaxModelsBytes = 1 << 20
	// MaxServedModels bounds the entries kept of one list: a longer list keeps its first ones
	// and counts the rest in ModelList.Dropped.
	MaxServedModels = 1024
	// maxModelID bounds the length of a model id or parent (bytes): Hugging Face ids are under
	// 100, local paths a few hundred.
	maxModelID = 512
	// DefaultModelsEvery is how often a target's /v1/models is read while the engine stays up:
	// the models an engine serves change only when it restarts or an adapter is loaded.
	DefaultModelsEvery = 30 * time.Second
)

// ErrNotModelList is returned by ParseModels for a page that is not an OpenAI model list.
var ErrNotModelList = errors.New("not an OpenAI model list")

// ServedModel is one entry of an engine's GET /v1/models.
type ServedModel struct {
	ID string `json:"id"`
	// Parent is the base model of a LoRA adapter (vLLM and llm-d's simulator set it; "" for a
	// base model).
	Parent string `json:"parent,omitempty"`
	// Root is what the model was loaded from (a path or the base model's id).
	Root        string `json:"root,omitempty"`
	MaxModelLen int64  `json:"max_model_len,omitempty"`
}

// ModelList is what an engine's GET /v1/models says it serves.
type ModelList struct {
	Models []ServedModel `json:"models"`
	// Dropped counts entries left out: beyond MaxServedModels, or with an empty or overlong id.
	Dropped int `json:"dropped,omitempty"`
}

// Find returns the entry of id (Models is sorted by id). An id without a tag also finds its
// ":latest" entry: Ollama lists tiny:latest and serves "tiny" as that model.
func (l *ModelList) Find(id string) (ServedModel, bool) {
	if l == nil {
		return ServedModel{}, false
	}
	cmp := func(m ServedModel, id string) int { return strings.Compare(m.ID, id) }
	i, ok := slices.BinarySearchFunc(l.Models, id, cmp)
	if !ok && id != "" && !strings.Contains(id, ":") {
		i, ok = slices.BinarySearchFunc(l.Models, id+":latest", cmp)
	}
	if !ok {
		return ServedModel{}, false
	}
	return l.Models[i], true
}

// IsAdapter reports whether id is listed as a LoRA adapter (an entry with a parent).
func (l *ModelList) IsAdapter(id string) bool {
	m, ok := l.Find(id)
	return ok && m.Parent != ""
}

// ParseModels reads an OpenAI model list: {"object": "list", "data": [{"id": ..., "parent":
// ..., "root": ..., "max_model_len": ...}, ...]} (vLLM, SGLang, llama.cpp, TGI, llm-d's
// simulator, Ollama). Fields other than these are ignored; an entry with an empty or overlong id is
// dropped and counted; duplicates count once. The page must be at most MaxModelsBytes.
func ParseModels(page []byte) (ModelList, error) {
	if len(page) > MaxModelsBytes {
		return ModelList{}, fmt.Errorf("%w (%d bytes)", ErrTooLarge, MaxModelsBytes)
	}
	var doc struct {
		Data []struct {
			ID          any `json:"id"`
			Parent      any `json:"parent"`
			Root        any `json:"root"`
			MaxModelLen any `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(page, &doc); err != nil {
		return ModelList{}, fmt.Errorf("%w: %v", ErrNotModelList, err)
	}
	if doc.Data == nil {
		return ModelList{}, fmt.Errorf("%w: no data array", ErrNotModelList)
	}
	var l ModelList
	seen := make(map[string]bool, len(doc.Data))
	for _, d := range doc.Data {
		id, ok := modelString(d.ID)
		if !ok || id == "" || seen[id] || len(l.Models) == MaxServedModels {
			l.Dropped++
			continue
		}
		seen[id] = true
		m := ServedModel{ID: id}
		m.Parent, _ = modelString(d.Parent)
		if m.Parent == id {
			m.Parent = "" // vLLM's base model is its own root, never its own parent
		}
		m.Root, _ = modelString(d.Root)
		if f, ok := d.MaxModelLen.(float64); ok && f >= 1 && f <= maxCapacity && f == float64(int64(f)) {
			m.MaxModelLen = int64(f)
		}
		l.Models = append(l.Models, m)
	}
	slices.SortFunc(l.Models, func(a, b ServedModel) int { return strings.Compare(a.ID, b.ID) })
	return l, nil
}

// modelString returns v as a model id: a string of valid UTF-8 up to maxModelID bytes.
func modelString(v any) (string, bool) {
	s, ok := v.(string)
	if !ok || len(s) > maxModelID || !utf8.ValidString(s) {
		return "", false
	}
	return s, true
}

// ModelsURL is the model list beside a metrics URL: the same scheme and host, path /v1/models
// (an engine serves both on its one port).
func ModelsURL(metricsURL string) (string, error) {
	u, err := url.Parse(metricsURL)
	if err != nil {
		return "", err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("metrics URL %q: want http:// or https:// and a host", metricsURL)
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: "/v1/models"}).String(), nil
}
