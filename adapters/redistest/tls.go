package redistest

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
)

// TLSFiles are a private CA and the certificates a TLS Redis needs, in PEM files: the servers'
// (for 127.0.0.1 and localhost, also used by cluster nodes as clients of each other's bus) and a
// client's, signed by the CA. Servers started with them require client certificates
// (tls-auth-clients yes, Redis's default).
type TLSFiles struct {
	CACert, ServerCert, ServerKey, ClientCert, ClientKey string
	// Config is a client's configuration: the CA and the client certificate.
	Config *tls.Config
}

// NewTLS writes a fresh CA and certificates into a directory of the test's.
func NewTLS(t testing.TB) *TLSFiles {
	t.Helper()
	f, err := newTLS(t.TempDir())
	if err != nil {
		t.Fatalf("redistest: TLS certificates: %v", err)
	}
	return f
}

func newTLS(dir string) (*TLSFiles, error) {
	f := &TLSFiles{CACert: filepath.Join(dir, "ca.crt"), ServerCert: filepath.Join(dir, "server.crt"), ServerKey: filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"), ClientKey: filepath.Join(dir, "client.key")}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redistest CA"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return nil, err
	}
	if err := writePEM(f.CACert, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	issue := func(serial int64, cn string, certFile, keyFile string, usage []x509.ExtKeyUsage) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage,
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kb, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyFile, "PRIVATE KEY", kb)
	}
	if err := issue(2, "redistest server", f.ServerCert, f.ServerKey, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}); err != nil {
		return nil, err
	}
	if err := issue(3, "redistest client", f.ClientCert, f.ClientKey, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}); err != nil {
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	f.Config = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}}
	return f, nil
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

// serverArgs are redis-server's arguments for TLS on port (plain TCP off).
func (f *TLSFiles) serverArgs(port int) []string {
	return []string{"--port", "0", "--tls-port", fmt.Sprint(port), "--tls-cert-file", f.ServerCert, "--tls-key-file", f.ServerKey,
		"--tls-ca-cert-file", f.CACert, "--tls-auth-clients", "yes"}
}

// cliArgs are redis-cli's arguments for TLS with the client certificate.
func (f *TLSFiles) cliArgs() []string {
	return []string{"--tls", "--cacert", f.CACert, "--cert", f.ClientCert, "--key", f.ClientKey}
}

// clientConfig is Config for a server reached at 127.0.0.1 (nil without TLS).
func (f *TLSFiles) clientConfig() *tls.Config {
	if f == nil {
		return nil
	}
	c := f.Config.Clone()
	c.ServerName = "127.0.0.1"
	return c
}
