package libvirtfake

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
)

// metaElem is one child of a domain's <metadata>: its namespace URI and the
// element as DomainGetMetadata returns it.
type metaElem struct {
	uri string
	xml string
}

// node is a minimal DOM built from encoding/xml's raw tokens, so prefixes and
// namespace declarations survive exactly as written.
type node struct {
	name     xml.Name // Space holds the prefix, not the URI
	nsDecls  []xml.Attr
	attrs    []xml.Attr
	children []*node
	text     *string // set for text nodes
	comment  *string // set for comment nodes
	parent   *node
}

func parseTree(doc string) (*node, error) {
	dec := xml.NewDecoder(strings.NewReader(doc))
	root := &node{}
	cur := root
	for {
		tok, err := dec.RawToken()
		if errors.Is(err, io.EOF) {
			return root, nil
		}
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			n := &node{name: t.Name, parent: cur}
			for _, a := range t.Attr {
				if a.Name.Space == "xmlns" || (a.Name.Space == "" && a.Name.Local == "xmlns") {
					n.nsDecls = append(n.nsDecls, a)
				} else {
					n.attrs = append(n.attrs, a)
				}
			}
			cur.children = append(cur.children, n)
			cur = n
		case xml.EndElement:
			if cur.parent == nil {
				return nil, errors.New("unbalanced end element " + t.Name.Local)
			}
			cur = cur.parent
		case xml.CharData:
			s := string(t)
			cur.children = append(cur.children, &node{text: &s, parent: cur})
		case xml.Comment:
			s := string(t)
			cur.children = append(cur.children, &node{comment: &s, parent: cur})
		}
	}
}

func (n *node) isElement() bool { return n.text == nil && n.comment == nil }

// namespace resolves the element's prefix against its own and its
// ancestors' declarations.
func (n *node) namespace() string {
	for e := n; e != nil; e = e.parent {
		for _, d := range e.nsDecls {
			if (n.name.Space == "" && d.Name.Space == "" && d.Name.Local == "xmlns") ||
				(n.name.Space != "" && d.Name.Space == "xmlns" && d.Name.Local == n.name.Space) {
				return d.Value
			}
		}
	}
	return ""
}

// extractMetadata returns the children of the domain's first <metadata>
// element the way libvirt keeps them: children without a namespace are
// dropped and only the first element of each namespace survives.
func extractMetadata(doc string) ([]metaElem, error) {
	tree, err := parseTree(doc)
	if err != nil {
		return nil, err
	}
	var domain, metadata *node
	for _, c := range tree.children {
		if c.isElement() {
			domain = c
			break
		}
	}
	if domain == nil {
		return nil, nil
	}
	for _, c := range domain.children {
		if c.isElement() && c.name.Space == "" && c.name.Local == "metadata" {
			metadata = c
			break
		}
	}
	if metadata == nil {
		return nil, nil
	}
	var out []metaElem
	seen := map[string]bool{}
	for _, c := range metadata.children {
		if !c.isElement() {
			continue
		}
		uri := c.namespace()
		if uri == "" || seen[uri] {
			continue
		}
		seen[uri] = true
		c.dropNamespace(uri)
		var b strings.Builder
		c.dump(&b, 0, true)
		out = append(out, metaElem{uri: uri, xml: b.String()})
	}
	return out, nil
}

// dropNamespace removes the element's declarations of uri and the prefixes bound by them
// from the element and its subtree: libvirtd (9.0) hands a metadata element back without
// its namespace, as <instance><managed>true</managed></instance>.
func (n *node) dropNamespace(uri string) {
	prefixes := map[string]bool{}
	kept := n.nsDecls[:0]
	for _, d := range n.nsDecls {
		if d.Value != uri {
			kept = append(kept, d)
			continue
		}
		if d.Name.Space == "xmlns" {
			prefixes[d.Name.Local] = true
		}
	}
	n.nsDecls = kept
	var walk func(*node)
	walk = func(e *node) {
		if !e.isElement() {
			return
		}
		if prefixes[e.name.Space] {
			e.name.Space = ""
		}
		for _, c := range e.children {
			walk(c)
		}
	}
	walk(n)
}

func qname(n xml.Name) string {
	if n.Space == "" {
		return n.Local
	}
	return n.Space + ":" + n.Local
}

// dump serialises a node the way libxml2's xmlNodeDump(..., level, format=1)
// does: empty elements self-close, namespace declarations come before
// attributes, and an element whose children are all elements gets them on
// lines of their own indented by two spaces per level. Any text child,
// whitespace included, turns that formatting off for the element's subtree,
// so an indented definition comes back with its own whitespace.
func (n *node) dump(b *strings.Builder, level int, format bool) {
	switch {
	case n.text != nil:
		b.WriteString(escapeText(*n.text))
		return
	case n.comment != nil:
		b.WriteString("<!--" + *n.comment + "-->")
		return
	}
	b.WriteString("<" + qname(n.name))
	for _, a := range n.nsDecls {
		b.WriteString(" " + qname(a.Name) + `="` + escapeAttr(a.Value) + `"`)
	}
	for _, a := range n.attrs {
		b.WriteString(" " + qname(a.Name) + `="` + escapeAttr(a.Value) + `"`)
	}
	if len(n.children) == 0 {
		b.WriteString("/>")
		return
	}
	if format {
		for _, c := range n.children {
			if c.text != nil {
				format = false
				break
			}
		}
	}
	b.WriteString(">")
	if format {
		b.WriteString("\n")
	}
	for _, c := range n.children {
		if format {
			b.WriteString(strings.Repeat("  ", level+1))
		}
		c.dump(b, level+1, format)
		if format {
			b.WriteString("\n")
		}
	}
	if format {
		b.WriteString(strings.Repeat("  ", level))
	}
	b.WriteString("</" + qname(n.name) + ">")
}

var (
	textEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "\r", "&#13;")
	attrEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;",
		"\n", "&#10;", "\r", "&#13;", "\t", "&#9;")
)

func escapeText(s string) string { return textEscaper.Replace(s) }
func escapeAttr(s string) string { return attrEscaper.Replace(s) }
