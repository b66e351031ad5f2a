package testutil

import (
	"fmt"
	"os"
	"os/exec"
)

// managerPackage is cmd/manager by import path, so that it builds from any directory of
// the module.
const managerPackage = "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/cmd/manager"

// BuildManager builds cmd/manager to out the way the image's binary is built (make
// image-tar: CGO_ENABLED=0, -trimpath); the error carries go build's output. That is also the configuration of
// make's vet and test tiers, so the build reuses their compiled dependencies whatever the
// environment of the test (the -race tier has cgo on); another configuration would
// compile every dependency once more, minutes on a cold cache.
func BuildManager(out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, managerPackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build -trimpath %s (CGO_ENABLED=0): %v\n%s", managerPackage, err, b)
	}
	return nil
}
