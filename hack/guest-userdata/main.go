// Command guest-userdata prints the user-data the operator renders for a Managed Proxy
// (proxyconfig.UserData), for a configuration given as JSON on stdin:
//
//	{"config": {"Port": 3128, "AllowedSourceRanges": ["10.123.0.0/24"],
//	            "AllowedDestinations": ["10.123.0.1/32"],
//	            "Credentials": {"Username": "smoke", "Password": "s3cret"}},
//	 "cloudInit": "#cloud-config\n..."}
//
// config holds proxyconfig.Config's fields (Credentials may be left out); cloudInit is the
// Proxy's own spec.cloudInit, combined as the operator combines it (optional).
// hack/guest-smoke.sh boots the test guest with its output. hack/bench/running-to-ready.sh
// also runs it in the tree of an older commit, where fields that release does not know
// are ignored, so it uses nothing of proxyconfig but Config and UserData.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

type input struct {
	Config    proxyconfig.Config `json:"config"`
	CloudInit string             `json:"cloudInit"`
}

func render(r io.Reader, w io.Writer) error {
	var in input
	if err := json.NewDecoder(r).Decode(&in); err != nil {
		return fmt.Errorf("reading the configuration (JSON on stdin): %w", err)
	}
	doc, err := proxyconfig.UserData(in.Config, in.CloudInit)
	if err != nil {
		return fmt.Errorf("rendering: %w", err)
	}
	_, err = w.Write(doc)
	return err
}

func main() {
	if err := render(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "guest-userdata:", err)
		os.Exit(1)
	}
}
