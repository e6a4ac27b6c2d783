package replay

import (
	"bytes"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/stampguard/stampguard/internal/rawjson"
)

// The objects' states, rebuilt from the log: every response that carries
// the object as stored (a write's responseObject, a get's) is a version of
// it at its resourceVersion. Admission's oldObject is the version a write
// replaced: the one at the write's stamp, or for a write without one the
// version just before the one it stored.

// maxVersions bounds the versions kept per object: enough for writes whose
// events the apiserver logged out of their order.
const maxVersions = 8

type objectKey struct{ group, resource, sub, ns, name string }

// version is one stored state of an object; obj is nil when the log says
// the object changed at rv without holding what it became.
type version struct {
	rv  uint64
	obj []byte
}

type objectState struct {
	versions []version // ascending rv
}

// stateKey is where a (sub)resource's objects are kept: status writes and
// reads carry the whole object; a scale's are Scale objects of their own.
func stateKey(ev *event) objectKey {
	sub := ev.Subresource
	if sub == "status" {
		sub = ""
	}
	return objectKey{ev.APIGroup, ev.Resource, sub, ev.Namespace, ev.Name}
}

func parseRV(s string) (uint64, bool) {
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil && n > 0
}

// objectRV reads metadata.resourceVersion of a stored object.
func objectRV(obj []byte) (uint64, bool) {
	if rawjson.Kind(obj) != '{' {
		return 0, false
	}
	md, ok, err := rawjson.Member(obj, "metadata")
	if err != nil || !ok || rawjson.Kind(md) != '{' {
		return 0, false
	}
	v, ok, err := rawjson.Member(md, "resourceVersion")
	if err != nil || !ok {
		return 0, false
	}
	s, err := rawjson.String(v)
	if err != nil {
		return 0, false
	}
	return parseRV(s)
}

// isStatus reports whether a response body is a metav1.Status (a refusal,
// or what some deletes answer) rather than the object.
func isStatus(obj []byte) bool {
	k, ok, err := rawjson.Member(obj, "kind")
	if err != nil || !ok {
		return false
	}
	s, _ := rawjson.String(k)
	return s == "Status"
}

func (st *objectState) add(rv uint64, obj []byte) {
	i, found := slices.BinarySearchFunc(st.versions, rv, func(v version, rv uint64) int {
		switch {
		case v.rv < rv:
			return -1
		case v.rv > rv:
			return 1
		}
		return 0
	})
	if obj != nil {
		obj = bytes.Clone(obj)
	}
	if found {
		if obj != nil {
			st.versions[i].obj = obj
		}
		return
	}
	st.versions = slices.Insert(st.versions, i, version{rv: rv, obj: obj})
	if len(st.versions) > maxVersions {
		st.versions = slices.Delete(st.versions, 0, len(st.versions)-maxVersions)
	}
}

// at is the version stored at rv.
func (st *objectState) at(rv uint64) (version, bool) {
	for _, v := range st.versions {
		if v.rv == rv {
			return v, true
		}
	}
	return version{}, false
}

// before is the newest version older than rv.
func (st *objectState) before(rv uint64) (version, bool) {
	for i := len(st.versions) - 1; i >= 0; i-- {
		if st.versions[i].rv < rv {
			return st.versions[i], true
		}
	}
	return version{}, false
}

// latest is the newest version.
func (st *objectState) latest() (version, bool) {
	if len(st.versions) == 0 {
		return version{}, false
	}
	return st.versions[len(st.versions)-1], true
}

// namespaceLabels answers namespaceSelector from the namespaces the log
// holds (their latest labels), or from the cluster's when given.
type namespaceLabels struct {
	seen    map[string]labels.Set
	cluster map[string]labels.Set
}

// Labels implements policy.NamespaceLabels. The apiserver labels every
// namespace with its name.
func (n *namespaceLabels) Labels(ns string) (labels.Set, bool) {
	if l, ok := n.cluster[ns]; ok {
		return l, true
	}
	if l, ok := n.seen[ns]; ok {
		return l, true
	}
	return labels.Set{"kubernetes.io/metadata.name": ns}, false
}

// observe records a namespace object's labels.
func (n *namespaceLabels) observe(name string, obj []byte) {
	set := labels.Set{"kubernetes.io/metadata.name": name}
	if md, ok, err := rawjson.Member(obj, "metadata"); err == nil && ok && rawjson.Kind(md) == '{' {
		if l, ok, err := rawjson.Member(md, "labels"); err == nil && ok && rawjson.Kind(l) == '{' {
			_ = rawjson.ObjectEach(l, func(k, v []byte) bool {
				key, err1 := rawjson.Unquote(k)
				val, err2 := rawjson.String(v)
				if err1 == nil && err2 == nil {
					set[key] = val
				}
				return true
			})
		}
	}
	if n.seen == nil {
		n.seen = map[string]labels.Set{}
	}
	n.seen[name] = set
}
