// Command tinymodel writes the tiny random-weight llama model (examples/ollama) as GGUF.
//
//	go run ./cmd/tinymodel -o bin/tiny.gguf [-seed 1]
//
// The same seed writes the same bytes.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvroute/caddy-kvroute/examples/ollama"
)

func main() {
	out := flag.String("o", "tiny.gguf", "output file")
	seed := flag.Uint64("seed", 1, "seed of the random weights")
	flag.Parse()
	if err := write(*out, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "tinymodel:", err)
		os.Exit(1)
	}
}

func write(path string, seed uint64) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := ollama.WriteTinyModel(f, seed); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
