// Package gce is the GCP provider (type gce): proxies as Compute Engine VMs, driven through
// the official REST client of cloud.google.com/go/compute/apiv1.
package gce

import (
	compute "cloud.google.com/go/compute/apiv1"
	_ "cloud.google.com/go/compute/apiv1/computepb"
	_ "google.golang.org/api/option"
)

var _ = compute.NewInstancesRESTClient
