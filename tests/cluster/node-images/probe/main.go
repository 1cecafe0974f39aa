// probe: a tiny static image for the real-node tests.
//
//	probe apiserver   GET https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version with the
//	                  pod's service account token and CA; prints the body, exits 0 on HTTP 200,
//	                  retrying for up to 60 s.
//	probe env         prints the environment, then waits like pause.
//	probe sleep       waits for SIGTERM/SIGINT.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"

func apiserver() int {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	ca, err := os.ReadFile(sa + "ca.crt")
	if err != nil {
		fmt.Fprintln(os.Stderr, "no service account CA:", err)
		return 2
	}
	token, err := os.ReadFile(sa + "token")
	if err != nil {
		fmt.Fprintln(os.Stderr, "no service account token:", err)
		return 2
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kubernetes.default.svc"}},
	}
	url := "https://" + net.JoinHostPort(host, port) + "/version"
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fmt.Printf("GET %s: %d %s\n", url, resp.StatusCode, body)
			if resp.StatusCode == http.StatusOK {
				return 0
			}
		} else {
			fmt.Printf("GET %s: %v\n", url, err)
		}
		if time.Now().After(deadline) {
			return 1
		}
		time.Sleep(time.Second)
	}
}

func wait() int {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	return 0
}

func main() {
	mode := "sleep"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "apiserver":
		os.Exit(apiserver())
	case "env":
		for _, kv := range os.Environ() {
			fmt.Println(kv)
		}
		os.Exit(wait())
	default:
		os.Exit(wait())
	}
}
