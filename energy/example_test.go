package energy_test

import (
	"fmt"

	"github.com/kvroute/caddy-kvroute/energy"
)

func ExampleParseJoules() {
	j, err := energy.ParseJoules("0.15mJ")
	if err != nil {
		panic(err)
	}
	fmt.Println(j, float64(j))
	_, err = energy.ParseJoules("150")
	fmt.Println(err)
	// Output:
	// 150µJ 0.00015
	// invalid energy "150": missing unit (J, mJ, uJ, µJ or nJ), e.g. 150uJ
}

func ExamplePlacer_Place() {
	gpu := &energy.Profile{Accelerator: energy.GPU, EnergyPerToken: 150e-6}
	npu := &energy.Profile{Accelerator: energy.NPU, EnergyPerToken: 50e-6}
	cands := []energy.Candidate{
		{Profile: gpu, InFlight: 0},
		{Profile: npu, InFlight: 2, QueuedTokens: 900},
		{Profile: nil, InFlight: 0}, // unknown: counts as the mean, 100µJ
	}
	fmt.Println(energy.NewPlacer(energy.Joule).Place(cands, 256))
	fmt.Println(energy.NewPlacer(energy.LeastBusy).Place(cands[1:], 256))
	// Output:
	// 1
	// 1
}

func ExampleSavedJoules() {
	p := &energy.Profile{EnergyPerToken: 150e-6, PrefillEnergyPerToken: 20e-6}
	fmt.Println(energy.SavedJoules(p, 3000)) // a 3000-token prefix was already cached
	// Output: 60mJ
}
