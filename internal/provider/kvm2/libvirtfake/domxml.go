package libvirtfake

import (
	"encoding/hex"
	"encoding/xml"
	"errors"
	"strconv"
	"strings"

	"github.com/digitalocean/go-libvirt"
)

// domainDef is what the fake reads from a domain's XML.
type domainDef struct {
	name        string
	uuid        libvirt.UUID
	hasUUID     bool
	uefi        bool
	title       string
	description string
	metadata    []metaElem
}

type domainXML struct {
	XMLName     xml.Name
	Type        *string `xml:"type,attr"`
	Name        string  `xml:"name"`
	UUID        string  `xml:"uuid"`
	Title       string  `xml:"title"`
	Description string  `xml:"description"`
	OS          struct {
		Firmware string `xml:"firmware,attr"`
		Loader   *struct {
			Type string `xml:"type,attr"`
		} `xml:"loader"`
		NVRAM *struct{} `xml:"nvram"`
	} `xml:"os"`
}

// parseDomainXML reads name, uuid, title, description, the firmware and the
// <metadata> children of a <domain> definition, failing with the error codes
// libvirt uses for malformed XML (ErrXMLDetail), a wrong root or missing type
// (ErrXMLError), a missing name (ErrNoName) and a malformed uuid
// (ErrInternalError).
func parseDomainXML(doc string) (*domainDef, error) {
	var x domainXML
	if err := xml.Unmarshal([]byte(doc), &x); err != nil {
		var se *xml.SyntaxError
		if errors.As(err, &se) {
			return nil, libvirt.Error{Code: uint32(libvirt.ErrXMLDetail),
				Message: "(domain_definition):" + strconv.Itoa(se.Line) + ": " + se.Msg}
		}
		return nil, Errorf(libvirt.ErrXMLError, "%s", err.Error())
	}
	if x.XMLName.Local != "domain" {
		return nil, Errorf(libvirt.ErrXMLError, "unexpected root element <%s>, expecting <domain>", x.XMLName.Local)
	}
	if x.Type == nil {
		return nil, Errorf(libvirt.ErrXMLError, "Missing required attribute 'type' in element 'domain'")
	}
	name := strings.TrimSpace(x.Name)
	if name == "" {
		return nil, libvirt.Error{Code: uint32(libvirt.ErrNoName), Message: "missing name information"}
	}
	d := &domainDef{name: name, title: x.Title, description: x.Description}
	if s := strings.TrimSpace(x.UUID); s != "" {
		u, err := parseUUID(s)
		if err != nil {
			return nil, err
		}
		d.uuid, d.hasUUID = u, true
	}
	d.uefi = x.OS.Firmware == "efi" || x.OS.NVRAM != nil || (x.OS.Loader != nil && x.OS.Loader.Type == "pflash")
	meta, err := extractMetadata(doc)
	if err != nil {
		return nil, Errorf(libvirt.ErrXMLError, "%s", err.Error())
	}
	d.metadata = meta
	return d, nil
}

func parseUUID(s string) (libvirt.UUID, error) {
	var u libvirt.UUID
	b, err := hex.DecodeString(strings.ReplaceAll(s, "-", ""))
	if err != nil || len(b) != len(u) {
		return u, Errorf(libvirt.ErrInternalError, "malformed uuid element")
	}
	copy(u[:], b)
	return u, nil
}
