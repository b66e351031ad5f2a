package hcloudfake

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// meta is the list answers' meta object; the page links are null where there is no
// such page, as the API sends them.
type meta struct {
	Pagination pagination `json:"pagination"`
}

type pagination struct {
	Page         int  `json:"page"`
	PerPage      int  `json:"per_page"`
	PreviousPage *int `json:"previous_page"`
	NextPage     *int `json:"next_page"`
	LastPage     int  `json:"last_page"`
	TotalEntries int  `json:"total_entries"`
}

// Page sizes: the API's default and its maximum (a larger per_page is cut to it).
const (
	DefaultPerPage = 25
	MaxPerPage     = 50
)

// paginate cuts items to the page the request asks for (page, per_page).
func paginate[T any](w http.ResponseWriter, r *http.Request, items []T) ([]T, meta, bool) {
	q := r.URL.Query()
	page, perPage := 1, DefaultPerPage
	for name, dst := range map[string]*int{"page": &page, "per_page": &perPage} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				invalidInput(w, name, fmt.Sprintf("%q is not a positive integer", v))
				return nil, meta{}, false
			}
			*dst = n
		}
	}
	perPage = min(perPage, MaxPerPage)
	last := max(1, (len(items)+perPage-1)/perPage)
	m := meta{Pagination: pagination{Page: page, PerPage: perPage, LastPage: last, TotalEntries: len(items)}}
	if page > 1 {
		p := min(page-1, last)
		m.Pagination.PreviousPage = &p
	}
	if page < last {
		n := page + 1
		m.Pagination.NextPage = &n
	}
	from := min(len(items), (page-1)*perPage)
	to := min(len(items), from+perPage)
	return items[from:to], m, true
}

// respond sorts items by the request's sort parameters over keys (an unknown one is
// invalid_input), cuts the page asked for and answers {key: [...], "meta": ...}.
func respond[T any](w http.ResponseWriter, r *http.Request, key string, items []T, keys map[string]func(a, b T) int) {
	less, err := sorter(r.URL.Query()["sort"], keys)
	if err != nil {
		invalidInput(w, "sort", err.Error())
		return
	}
	slices.SortStableFunc(items, less)
	page, m, ok := paginate(w, r, items)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{key: nonNil(page), "meta": m})
}

// sorter builds the order of sort parameters ("id", "name:desc"...) over the keys a
// list knows; an unknown key is an error, as the API refuses it.
func sorter[T any](params []string, keys map[string]func(a, b T) int) (func(a, b T) int, error) {
	var fns []func(a, b T) int
	for _, p := range params {
		key, dir, _ := strings.Cut(p, ":")
		f, ok := keys[key]
		if !ok || dir != "" && dir != "asc" && dir != "desc" {
			return nil, fmt.Errorf("cannot sort by %q", p)
		}
		if dir == "desc" {
			f0 := f
			f = func(a, b T) int { return -f0(a, b) }
		}
		fns = append(fns, f)
	}
	if id, ok := keys["id"]; ok {
		fns = append(fns, id)
	}
	return func(a, b T) int {
		for _, f := range fns {
			if c := f(a, b); c != 0 {
				return c
			}
		}
		return 0
	}, nil
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// nonNil makes an empty list encode as [], as the API sends it.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
