package clustertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// testCA returns a server certificate for 127.0.0.1 signed by a new CA, and the CA's PEM file.
func testCA(t *testing.T) (tls.Certificate, string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvroute test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, path
}

func TestTLSCA(t *testing.T) {
	cert, caFile := testCA(t)
	s := startNATS(t, func(o *server.Options) {
		o.TLS = true
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		o.TLSTimeout = 2
	})
	url := fmt.Sprintf("tls://127.0.0.1:%d", s.opts.Port)
	cfg := config(url)
	cfg.TLSCA = caFile
	a, b := join(t, cfg), join(t, cfg)
	connected(t, a, b)
	a.PublishDecision("m", "u", "over TLS")
	eventually(t, 3*time.Second, "decision over TLS", func() bool { return b.st.numDecisions() == 1 })

	// Without tls_ca the server's certificate does not verify: the node never connects.
	untrusting := join(t, config(url))
	time.Sleep(time.Second)
	if untrusting.Stats().Connected {
		t.Error("connected over TLS to a server signed by an unknown CA")
	}
}

func TestUserPasswordInURL(t *testing.T) {
	s := startNATS(t, func(o *server.Options) { o.Username, o.Password = "kvroute", "s3cret-pass" })
	good := fmt.Sprintf("nats://kvroute:s3cret-pass@127.0.0.1:%d", s.opts.Port)
	bad := fmt.Sprintf("nats://kvroute:wrong@127.0.0.1:%d", s.opts.Port)
	a, b := join(t, config(good)), join(t, config(good))
	connected(t, a, b)
	a.PublishDecision("m", "u", "authenticated")
	eventually(t, 3*time.Second, "decision with user:pass", func() bool { return b.st.numDecisions() == 1 })
	x := join(t, config(bad))
	time.Sleep(500 * time.Millisecond)
	if x.Stats().Connected {
		t.Error("connected with a wrong password")
	}
	// A connected node whose credentials the server refuses for a while (rotated on the
	// server first) keeps trying, where nats.go would give up after two auth errors by
	// default, and is back once they are accepted again.
	s.stop()
	s.opts.Password = "rotated"
	s.start()
	eventually(t, 3*time.Second, "a still connected", func() bool { return !a.Stats().Connected })
	time.Sleep(2 * time.Second) // several refused attempts
	s.stop()
	s.opts.Password = "s3cret-pass"
	s.start()
	connected(t, a)
}
