package caddyfile_test

import (
	"fmt"

	cf "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/kvroute/caddy-kvroute/caddyfile"
)

func ExampleParseUpstream() {
	d := cf.NewTestDispenser(`upstream 10.0.0.1:8000 {
		accelerator      gpu
		models           llama-3.1-8b qwen*
		energy_per_token 150uJ
		kv_capacity      2M
	}`)
	d.Next() // on "upstream", as a policy's option loop leaves it
	addr, p, err := caddyfile.ParseUpstream(d)
	if err != nil {
		panic(err)
	}
	fmt.Println(addr, p.Accelerator, p.Models, p.EnergyPerToken, p.KVCapacity)

	d = cf.NewTestDispenser("upstream 10.0.0.2:8000 {\n\tenergy_per_token 150\n}")
	d.Next()
	_, _, err = caddyfile.ParseUpstream(d)
	fmt.Println(err)
	// Output:
	// 10.0.0.1:8000 gpu [llama-3.1-8b qwen*] 150µJ 2000000
	// upstream 10.0.0.2:8000: energy_per_token: invalid energy "150": missing unit (J, mJ, uJ, µJ or nJ), e.g. 150uJ, at Testfile:2
}

func ExampleParseSize() {
	for _, s := range []string{"4MiB", "64Mi", "64M", "2k", "1000"} {
		n, _ := caddyfile.ParseSize(s)
		fmt.Println(s, n)
	}
	// Output:
	// 4MiB 4194304
	// 64Mi 67108864
	// 64M 64000000
	// 2k 2000
	// 1000 1000
}
