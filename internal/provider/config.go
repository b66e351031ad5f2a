package provider

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Config is the providers config file (--providers-config).
type Config struct {
	Providers []ProviderConfig `json:"providers"`
}

// ProviderConfig is one entry. Exactly the block named by Type is set.
type ProviderConfig struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// KVM2 is the block of a kvm2 entry.
	KVM2 *KVMConfig `json:"kvm2,omitempty"`
	// KVM is the block of a kvm (first-generation) entry; same shape as KVM2.
	KVM *KVMConfig `json:"kvm,omitempty"`
	// GCE is the block of a gce entry.
	GCE *GCEConfig `json:"gce,omitempty"`
	// HCloud is the block of an hcloud (Hetzner Cloud) entry.
	HCloud *HCloudConfig `json:"hcloud,omitempty"`
	// Prices are what the entry's instances cost per hour (config_prices.go), over the
	// type's default table.
	Prices *Prices `json:"prices,omitempty"`
}

// Provider type names.
const (
	TypeKVM2   = "kvm2"
	TypeKVM    = "kvm"
	TypeGCE    = "gce"
	TypeHCloud = "hcloud"
)

// LoadConfig reads and validates the providers config file at path.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read providers config: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("providers config %s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig decodes and validates a providers config. Unknown fields, duplicate keys and
// every rule of Validate are errors; all problems of the file are reported at once,
// joined, in file order. Defaults are not applied: each provider applies its own.
func ParseConfig(data []byte) (*Config, error) {
	jsonData, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("does not parse: %w", err)
	}
	var raw any
	if err := json.Unmarshal(jsonData, &raw); err != nil {
		return nil, fmt.Errorf("does not parse: %w", err)
	}
	var problems []error
	if raw != nil {
		if _, ok := raw.(map[string]any); !ok {
			return nil, errors.New("top level: must be a mapping with a providers list")
		}
		problems = unknownFields(raw)
	}
	cfg := &Config{}
	if err := yaml.Unmarshal(data, cfg); err != nil {
		// A value of the wrong type leaves the rest undecoded; only report what is known.
		return nil, errors.Join(append(problems, fmt.Errorf("does not parse: %w", err))...)
	}
	if err := cfg.Validate(); err != nil {
		problems = append(problems, err)
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Validate checks every entry and returns all problems joined, in config order. Each
// message names the provider, then the block and path inside it, for example
// `provider "kvm2-home": kvm2.hosts[0]: bridge is required`.
func (c *Config) Validate() error {
	var problems []error
	seen := map[string]int{}
	for i, pc := range c.Providers {
		prefix := providerPrefix(i, pc.Name)
		if j, dup := seen[pc.Name]; dup && pc.Name != "" {
			problems = append(problems, fmt.Errorf("%s: name is already used by providers[%d]", prefix, j))
		} else if pc.Name != "" {
			seen[pc.Name] = i
		}
		for _, err := range pc.validate() {
			problems = append(problems, fmt.Errorf("%s: %w", prefix, err))
		}
	}
	return errors.Join(problems...)
}

func providerPrefix(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("providers[%d]", i)
	}
	return fmt.Sprintf("provider %q", name)
}

// validate checks one entry: its name, its type, that exactly the matching block is set,
// and its prices.
func (pc ProviderConfig) validate() []error {
	return append(pc.validateBlock(), pc.validatePrices()...)
}

// validateBlock checks the entry's name, its type and its type's block.
func (pc ProviderConfig) validateBlock() []error {
	var problems []error
	if pc.Name == "" {
		problems = append(problems, errors.New("name is required"))
	} else if msgs := validation.IsDNS1123Subdomain(pc.Name); len(msgs) > 0 {
		// The name becomes the ProviderHealth object's name and a metrics label.
		problems = append(problems, fmt.Errorf("name %q is not a valid object name: %s", pc.Name, strings.Join(msgs, "; ")))
	}
	set := map[string]bool{TypeKVM2: pc.KVM2 != nil, TypeKVM: pc.KVM != nil, TypeGCE: pc.GCE != nil, TypeHCloud: pc.HCloud != nil}
	switch pc.Type {
	case "":
		return append(problems, fmt.Errorf("type is required (one of %s)", strings.Join(knownTypes, ", ")))
	case TypeKVM2, TypeKVM, TypeGCE, TypeHCloud:
	default:
		return append(problems, fmt.Errorf("unknown type %q (one of %s)", pc.Type, strings.Join(knownTypes, ", ")))
	}
	for _, other := range knownTypes {
		if other != pc.Type && set[other] {
			problems = append(problems, fmt.Errorf("a %s: block does not match type %s", other, pc.Type))
		}
	}
	if !set[pc.Type] {
		return append(problems, fmt.Errorf("type %s needs a %s: block", pc.Type, pc.Type))
	}
	switch pc.Type {
	case TypeGCE:
		return append(problems, pc.GCE.Validate(pc.Type)...)
	case TypeHCloud:
		return append(problems, pc.HCloud.Validate(pc.Type)...)
	case TypeKVM:
		return append(problems, pc.KVM.Validate(pc.Type)...)
	}
	return append(problems, pc.KVM2.Validate(pc.Type)...)
}

// knownTypes are the types the config has a block for, sorted.
var knownTypes = []string{TypeGCE, TypeHCloud, TypeKVM, TypeKVM2}

// unknownFields walks the decoded document against Config's json tags and reports every
// key no field takes, with its path. Keys must match a tag exactly (encoding/json alone
// would accept "SSHKeyFile" for sshKeyFile).
func unknownFields(raw any) []error {
	top, _ := raw.(map[string]any)
	var problems []error
	for _, k := range sortedKeys(top) {
		if k != "providers" {
			problems = append(problems, fmt.Errorf("top level: unknown field %q", k))
		}
	}
	list, _ := top["providers"].([]any)
	for i, item := range list {
		entry, ok := item.(map[string]any)
		if !ok {
			continue // the typed decode reports the wrong type
		}
		name, _ := entry["name"].(string)
		prefix := providerPrefix(i, name)
		for _, p := range walkUnknown("", entry, reflect.TypeFor[ProviderConfig]()) {
			problems = append(problems, fmt.Errorf("%s: %s", prefix, p))
		}
	}
	return problems
}

// walkUnknown returns "path: unknown field \"k\"" for every unknown key under v.
func walkUnknown(path string, v any, t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		fields := jsonFields(t)
		for _, k := range sortedKeys(m) {
			ft, ok := fields[k]
			if !ok {
				if path == "" {
					out = append(out, fmt.Sprintf("unknown field %q", k))
				} else {
					out = append(out, fmt.Sprintf("%s: unknown field %q", path, k))
				}
				continue
			}
			out = append(out, walkUnknown(joinPath(path, k), m[k], ft)...)
		}
	case reflect.Map:
		m, _ := v.(map[string]any)
		for _, k := range sortedKeys(m) {
			out = append(out, walkUnknown(path+"."+k, m[k], t.Elem())...)
		}
	case reflect.Slice:
		l, _ := v.([]any)
		for i, item := range l {
			out = append(out, walkUnknown(fmt.Sprintf("%s[%d]", path, i), item, t.Elem())...)
		}
	}
	return out
}

func joinPath(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// jsonFields maps each json field name of struct type t to the field's type.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		out[name] = f.Type
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
