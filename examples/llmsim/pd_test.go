package llmsim

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestPDHandshake(t *testing.T) {
	tr := NewTransfers()
	p, err := StartWorker("127.0.0.1:0", Config{Name: "p", Role: RolePrefill, Transfers: tr, Speed: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d, err := StartWorker("127.0.0.1:0", Config{Name: "d", Role: RoleDecode, Transfers: tr, Speed: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	post := func(url, body string) (int, map[string]json.RawMessage) {
		t.Helper()
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]json.RawMessage
		_ = json.Unmarshal(b, &m)
		return resp.StatusCode, m
	}
	msgs := `"messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 200) + `"}]`
	code, ans := post(p.URL, `{`+msgs+`,"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`)
	if code != 200 || len(ans["kv_transfer_params"]) == 0 {
		t.Fatalf("prefill: status %d, answer %v", code, ans)
	}
	kv := string(ans["kv_transfer_params"])
	if code, _ := post(p.URL, `{`+msgs+`,"max_tokens":1,"stream":true,"kv_transfer_params":{"do_remote_decode":true}}`); code != 400 {
		t.Errorf("streamed prefill leg: status %d, want 400", code)
	}
	decode := `{` + msgs + `,"max_tokens":3,"kv_transfer_params":` + kv + `}`
	if code, _ := post(d.URL, decode); code != 200 {
		t.Fatalf("decode with the prefill's transfer: status %d", code)
	}
	if code, _ := post(d.URL, decode); code != 400 {
		t.Errorf("decode reusing a transfer: status %d, want 400", code)
	}
	forged := `{` + msgs + `,"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p","remote_block_ids":["p/999"]}}`
	if code, _ := post(d.URL, forged); code != 400 {
		t.Errorf("decode with a forged transfer: status %d, want 400", code)
	}
	if code, _ := post(d.URL, `{`+msgs+`}`); code != 200 {
		t.Errorf("aggregated request on a decode worker: status %d, want 200", code)
	}
	if tr.Served.Load() != 1 || tr.Taken.Load() != 1 || tr.Refused.Load() != 2 || tr.Pending() != 0 {
		t.Errorf("served %d taken %d refused %d pending %d; want 1 1 2 0", tr.Served.Load(), tr.Taken.Load(), tr.Refused.Load(), tr.Pending())
	}
}
