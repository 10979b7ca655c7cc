// Package clustertest tests package cluster against a real NATS server embedded in the test
// process. It is its own module because nats-server requires newer versions of modules Caddy
// also uses (klauspost/compress, x/crypto): in the main go.mod it would change a user's build.
package clustertest
