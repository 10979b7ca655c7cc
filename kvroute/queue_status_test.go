package kvroute

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// metricPresent reports whether the admin /metrics endpoint shows series.
func metricPresent(t testing.TB, series string) bool {
	t.Helper()
	_, body := adminCall(t, http.MethodGet, "/metrics")
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), series+" ") {
			return true
		}
	}
	return false
}

// GET /kvroute/ names the queue's bands as the metrics do, and a request without a tenant as
// the tenant the metrics name (issue 40, item 15): "default", never "".
func TestQueueStatusNames(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, `flow_control {
				tenant   {http.request.header.X-Tenant}
				priority {http.request.header.X-Priority}
				band names-hi {
					queue_timeout 1m
				}
				band names-lo {
					queue_timeout 1m
				}
			}`, ""))
	first := occupy(t, g)
	a := enqueue(t, "/v1/chat/completions", chatBody("m", "no tenant"), "X-Req", "a", "X-Priority", "names-lo")
	b := enqueue(t, "/v1/chat/completions", chatBody("m", "a tenant"), "X-Req", "b", "X-Tenant", "names-acme", "X-Priority", "names-hi")
	c := enqueue(t, "/v1/chat/completions", chatBody("m", "no tenant either"), "X-Req", "c", "X-Priority", "names-lo")
	q := adminStatus(t).Queue
	if q == nil || q.Waiting != 3 || len(q.Bands) != 2 || q.Bands["names-hi"] != 1 || q.Bands["names-lo"] != 2 {
		t.Errorf("GET /kvroute/ queue %+v, want 3 waiting, bands {names-hi: 1, names-lo: 2}", q)
	}
	var names []string
	for _, ts := range q.Tenants {
		names = append(names, ts.Name)
		if ts.Name == "" {
			t.Errorf("a tenant named \"\" in GET /kvroute/: %+v", ts)
		}
	}
	if ts := tenantStatus(t, "default"); ts.Waiting != 2 {
		t.Errorf("tenant %q waiting %d (tenants %v), want the 2 requests without a tenant", "default", ts.Waiting, names)
	}
	g.releaseN(t, 4)
	mustOK(t, first, a, b, c)
	// The metrics name the same tenant.
	waitFor(t, func() bool { return metricValue(t, `caddy_kvroute_tenant_tokens_served{tenant="default"}`) > 0 },
		"the metrics name the tenant of requests without one default")
	if metricPresent(t, `caddy_kvroute_tenant_tokens_served{tenant=""}`) {
		t.Errorf(`caddy_kvroute_tenant_tokens_served{tenant=""} exported`)
	}
}

// The queue's metrics exist, at 0, for every configured band from the config's start: an
// operator who looks for them before the first wait finds them (issue 40, item 15).
func TestQueueMetricsFromStart(t *testing.T) {
	g := newGated(t)
	startCaddy(t, queueConfig(g, `flow_control {
				band start-hi {
					queue_timeout 1m
				}
				band start-lo {
					queue_timeout 1m
				}
			}`, ""))
	for _, band := range []string{"start-hi", "start-lo"} {
		for _, series := range []string{
			`caddy_kvroute_queue_requests{band="` + band + `"}`,
			`caddy_kvroute_queue_seconds_count{band="` + band + `"}`,
			`caddy_kvroute_shed_total{band="` + band + `",reason="timeout"}`,
			`caddy_kvroute_shed_total{band="` + band + `",reason="queue_full"}`,
			`caddy_kvroute_shed_total{band="` + band + `",reason="tenant_full"}`,
		} {
			if !metricPresent(t, series) {
				t.Errorf("%s not exported before the first wait", series)
			} else if v := metricValue(t, series); v != 0 {
				t.Errorf("%s = %v before any request, want 0", series, v)
			}
		}
	}
	// Late binding without flow_control: its one band.
	load(t, queueConfig(g, "queue_timeout 30s", ""))
	if !metricPresent(t, `caddy_kvroute_queue_requests{band="default"}`) {
		t.Errorf(`caddy_kvroute_queue_requests{band="default"} not exported with queue_timeout`)
	}
}
