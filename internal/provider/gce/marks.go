package gce

import (
	"fmt"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/google/uuid"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
)

// The labels that mark an instance as this provider's, and the metadata keys it writes.
const (
	LabelProvider = "epo-provider"
	LabelInstall  = "epo-install"
	LabelUID      = "epo-uid"

	MetadataUserData = "user-data"
	MetadataSpecHash = "epo-spec-hash"
	// MetadataUID holds the Proxy UID exactly; the label holds it in label charset.
	MetadataUID = "epo-uid"
)

// labels are the marks of an instance owned by uid.
func (p *Provider) labels(uid string) map[string]string {
	l := map[string]string{LabelProvider: ident.LabelValue(p.name), LabelUID: ident.LabelValue(uid)}
	if p.installID != "" {
		l[LabelInstall] = ident.LabelValue(p.installID)
	}
	return l
}

// ownership says whose an instance is.
type ownership int

const (
	ownedHere        ownership = iota // this provider entry and install
	otherInstall                      // this provider's mark, another install's
	notThisProviders                  // no mark of this provider entry at all
)

func (p *Provider) owner(inst *computepb.Instance) ownership {
	l := inst.GetLabels()
	if l[LabelProvider] != ident.LabelValue(p.name) {
		return notThisProviders
	}
	if l[LabelInstall] != ident.LabelValue(p.installID) {
		return otherInstall
	}
	return ownedHere
}

// ownerUID is the Proxy UID an instance records: its metadata, else its label.
func ownerUID(inst *computepb.Instance) string {
	if uid := metadataValue(inst, MetadataUID); uid != "" {
		return uid
	}
	return inst.GetLabels()[LabelUID]
}

// metadataValue returns the value of key in the instance's metadata.
func metadataValue(inst *computepb.Instance, key string) string {
	for _, it := range inst.GetMetadata().GetItems() {
		if it.GetKey() == key {
			return it.GetValue()
		}
	}
	return ""
}

// requestIDSpace is the UUID namespace of the requestIds the provider derives.
var requestIDSpace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/gce/request-id"))

// requestID derives the requestId of an insert or delete: a name-based UUID (version 5,
// RFC 9562, the standard deterministic kind) of the parts and the number of earlier
// operations of the same key that reached DONE. A retry of a call that never answered
// repeats the same ID, and GCE returns the first call's operation instead of doing the
// work twice; once an operation finished (failed, or succeeded and the instance was
// later preempted) the next call gets a fresh ID, because GCE would otherwise replay the
// finished operation.
func requestID(attempt int, parts ...string) string {
	var b strings.Builder
	for _, s := range parts {
		b.WriteString(s)
		b.WriteByte(0)
	}
	fmt.Fprintf(&b, "%d", attempt)
	return uuid.NewSHA1(requestIDSpace, []byte(b.String())).String()
}

// lastSegment is the part of a resource URL after its last slash (zones/x: x).
func lastSegment(url string) string {
	return url[strings.LastIndex(url, "/")+1:]
}
