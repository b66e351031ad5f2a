package testutil

import (
	"fmt"
	"os"
	"os/exec"
)

// managerPackage is cmd/manager by import path, so that it builds from any directory of
// the module.
const managerPackage = "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/cmd/manager"

// gatewayPackage is cmd/gateway by import path.
const gatewayPackage = "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/cmd/gateway"

// BuildManager builds cmd/manager to out the way the image's binary is built (make
// image-tar: CGO_ENABLED=0, -trimpath); the error carries go build's output. That is also the configuration of
// make's vet and test tiers, so the build reuses their compiled dependencies whatever the
// environment of the test (the -race tier has cgo on); another configuration would
// compile every dependency once more, minutes on a cold cache.
func BuildManager(out string) error { return build(out, managerPackage) }

// BuildGateway builds cmd/gateway to out as BuildManager builds the manager.
func BuildGateway(out string) error { return build(out, gatewayPackage) }

func build(out, pkg string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build -trimpath %s (CGO_ENABLED=0): %v\n%s", pkg, err, b)
	}
	return nil
}
