// Command probe runs inside the real node's test pods: it resolves names with Go's own
// resolver (which reads the pod's resolv.conf: search list, ndots), fetches URLs, serves
// a line of text, and calls the API server as the pod's service account.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe resolve NAME... | get URL | serve PORT TEXT | apiserver")
	}
	switch os.Args[1] {
	case "resolve":
		for _, name := range os.Args[2:] {
			addrs, err := net.LookupHost(name)
			if err != nil {
				fail("resolve %s: %v", name, err)
			}
			fmt.Printf("%s %s\n", name, strings.Join(addrs, ","))
		}
	case "get":
		c := http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(os.Args[2])
		if err != nil {
			fail("get %s: %v", os.Args[2], err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d %s", resp.StatusCode, body)
	case "serve":
		host, _ := os.Hostname()
		http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s from %s\n", os.Args[3], host)
		})
		if err := http.ListenAndServe(":"+os.Args[2], nil); err != nil {
			fail("serve: %v", err)
		}
	case "apiserver":
		apiserver()
	default:
		fail("unknown command %q", os.Args[1])
	}
}

// apiserver GETs /version and creates a SelfSubjectReview through the `kubernetes`
// Service (KUBERNETES_SERVICE_HOST and the DNS name), checking the serving cert
// against the mounted CA and authenticating with the mounted token.
func apiserver() {
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		fail("token: %v", err)
	}
	pem, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		fail("ca: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		fail("ca.crt holds no certificate")
	}
	c := http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	env := "https://" + net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	for _, base := range []string{env, "https://kubernetes.default.svc"} {
		req, _ := http.NewRequest("GET", base+"/version", nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		resp, err := c.Do(req)
		if err != nil {
			fail("GET %s/version: %v", base, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("GET %s/version %d %s\n", base, resp.StatusCode, strings.Join(strings.Fields(string(body)), ""))
	}
	review := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	req, _ := http.NewRequest("POST", "https://kubernetes.default.svc/apis/authentication.k8s.io/v1/selfsubjectreviews",
		strings.NewReader(review))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		fail("selfsubjectreview: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("POST selfsubjectreviews %d %s\n", resp.StatusCode, strings.Join(strings.Fields(string(body)), ""))
}
