package kvroute

import (
	"fmt"
	"net"
	"strings"
	"testing"
)

// The in-process Caddy's ports (caddytest): free ones, picked when the test binary starts,
// so that two runs of these tests on one machine (a developer's and CI's, two worktrees, two
// packages) neither load their configs into each other's Caddy (caddytest takes whatever
// answers on its admin port for its own) nor fight for a site's port. Configs name them
// through adminAddr, httpPort, httpPort2 and httpsPort; TestMain gives adminPort to caddytest
// (whose default is the fixed 2999).
//
// A port is free when picked and Caddy binds it at the first config: in between, only a
// process that binds that very port, or connects from it, can take it (rare); an admin port
// taken by another Caddy is caught by startCaddy (the config does not reach this process's
// state).
var (
	testPorts = pickFreePorts(4)
	adminPort = testPorts[0]
	httpPort  = testPorts[1]
	httpPort2 = testPorts[2] // a second site, for the configs that need two
	// httpsPort goes into configs as https_port (text); every site names its port, so Caddy
	// never binds it.
	httpsPort = fmt.Sprint(testPorts[3])
	adminAddr = fmt.Sprintf("localhost:%d", adminPort)
	adminURL  = "http://" + adminAddr
	baseURL   = fmt.Sprintf("http://localhost:%d", httpPort)
)

// pickFreePorts returns n distinct ports free on every interface (Caddy binds a site's port on
// all of them): all n are held open together, so that the kernel gives n different ones.
func pickFreePorts(n int) []int {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			panic(fmt.Sprintf("kvroute tests: no free port: %v", err))
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// fixedAdmin is the admin address the tests' configs named before the ports were free ones.
const fixedAdmin = "localhost:2999"

// checkPorts fails a test whose config names the fixed admin address: loaded into the
// in-process Caddy, it would move the admin endpoint away from caddytest's (every later test
// of the run then fails to load its config) and clash with any other Caddy on 2999.
func checkPorts(t testing.TB, config string) {
	t.Helper()
	if strings.Contains(config, fixedAdmin) {
		t.Fatalf("the config names admin %s: name adminAddr (ports_test.go), this run's free admin address", fixedAdmin)
	}
}
