package llmsim

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSGLangBootstrap(t *testing.T) {
	tr := NewTransfers()
	start := func(name, role, boot string) *Worker {
		w, err := StartWorker("127.0.0.1:0", Config{Name: name, Role: role, Protocol: ProtocolSGLang, Transfers: tr,
			BootstrapAddr: boot, BootstrapTimeout: 300 * time.Millisecond, Speed: 100})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w
	}
	p := start("p", RolePrefill, "127.0.0.1:9101")
	d := start("d", RoleDecode, "")
	post := func(url, body string) (int, string) {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	msgs := `"messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 200) + `"}]`
	req := func(port int, room uint64, stream bool) string {
		return fmt.Sprintf(`{%s,"max_tokens":3,"stream":%t,"bootstrap_host":"127.0.0.1","bootstrap_port":%d,"bootstrap_room":%d}`, msgs, stream, port, room)
	}
	// Both legs at once, the decode's first: it waits for the prefill of its room.
	both := func(body string) (pc, dc int, dAns string) {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); dc, dAns = post(d.URL, body) }()
		go func() { defer wg.Done(); pc, _ = post(p.URL, body) }()
		wg.Wait()
		return
	}
	const room = 1<<63 - 1 // the largest room SGLang draws: a float64 would round it
	pc, dc, ans := both(req(9101, room, true))
	if pc != 200 || dc != 200 || !strings.Contains(ans, "[DONE]") {
		t.Fatalf("handshake: prefill %d, decode %d %q", pc, dc, ans)
	}
	if tr.Served.Load() != 1 || tr.Taken.Load() != 1 || tr.Pending() != 0 {
		t.Fatalf("served %d taken %d pending %d; want 1 1 0", tr.Served.Load(), tr.Taken.Load(), tr.Pending())
	}
	// A used room is refused on both sides, at once.
	if pc, dc, _ := both(req(9101, room, false)); pc != 400 || dc != 400 {
		t.Errorf("reused room: prefill %d, decode %d; want 400 400", pc, dc)
	}
	// A room no prefill worker serves: the decode worker gives up after its timeout.
	if dc, ans := post(d.URL, req(9101, 7, false)); dc != 400 || !strings.Contains(ans, "no prefill worker") {
		t.Errorf("unknown room: decode %d %q", dc, ans)
	}
	// A room addressed to another bootstrap server: the prefill worker refuses it.
	if pc, _ := post(p.URL, req(9102, 8, false)); pc != 400 {
		t.Errorf("another engine's room: prefill %d, want 400", pc)
	}
	// A prefill whose KV no decode worker takes fails after its timeout.
	if pc, _ := post(p.URL, req(9101, 9, false)); pc != 500 {
		t.Errorf("untaken room: prefill %d, want 500", pc)
	}
	// Without bootstrap data, both refuse: an SGLang decode server cannot serve a whole request.
	for _, w := range []*Worker{p, d} {
		if c, _ := post(w.URL, `{`+msgs+`}`); c != 400 {
			t.Errorf("%s without bootstrap data: %d, want 400", w.cfg.Name, c)
		}
	}
	if tr.Pending() != 0 {
		t.Errorf("%d rooms left pending", tr.Pending())
	}
	for _, w := range []*Worker{p, d} {
		if st := w.Stats(); st.Running != 0 {
			t.Errorf("%s: %d running", w.cfg.Name, st.Running)
		}
	}
}
