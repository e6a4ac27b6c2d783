package policy

import (
	"errors"
	"slices"

	"github.com/stampguard/stampguard/internal/rawjson"
)

// Operation is the admission operation.
type Operation string

// The admission operations stampguard acts on.
const (
	Create Operation = "CREATE"
	Update Operation = "UPDATE"
	Delete Operation = "DELETE"
)

// UserInfo is the authenticated writer of a request.
type UserInfo struct {
	Name   string
	Groups []string
}

// DecodeUserInfo reads an authentication.k8s.io UserInfo (an
// AdmissionRequest's userInfo, an audit event's user or impersonatedUser)
// from raw JSON: its username and groups. Null is the empty user; anything
// else that is not an object is an error.
func DecodeUserInfo(v []byte) (UserInfo, error) {
	var u UserInfo
	if rawjson.IsNull(v) {
		return u, nil
	}
	var err error
	walkErr := rawjson.ObjectEach(v, func(k, v []byte) bool {
		switch {
		case rawjson.KeyIs(k, "username"):
			u.Name, err = rawjson.String(v)
		case rawjson.KeyIs(k, "groups"):
			u.Groups, err = rawjson.Strings(v)
		}
		return err == nil
	})
	return u, errors.Join(walkErr, err)
}

func (u UserInfo) in(users, groups []string) bool {
	if _, ok := slices.BinarySearch(users, u.Name); ok {
		return true
	}
	for _, g := range u.Groups {
		if _, ok := slices.BinarySearch(groups, g); ok {
			return true
		}
	}
	return false
}

// Request is what evaluation needs of an AdmissionRequest. Object, OldObject
// and Options stay raw JSON; rules read only the values they name.
type Request struct {
	Operation   Operation
	Group       string // request.resource.group
	Resource    string // request.resource.resource (plural)
	SubResource string
	Namespace   string
	// Name is empty for the per-item deletes of a deletecollection: the
	// apiserver builds their admission attributes without a name.
	Name      string
	User      UserInfo
	Object    []byte
	OldObject []byte
	Options   []byte
	DryRun    bool

	// Values extracted by ScanObject while the review was decoded.
	scanned   [2]bool
	extracted [2][]valueRef
}

// ResourceName is the request's resource as logs and reports name it:
// resource[.group][/subresource], "deployments.apps/scale".
func (r *Request) ResourceName() string {
	s := resourceName(r.Group, r.Resource)
	if r.SubResource != "" {
		s += "/" + r.SubResource
	}
	return s
}

const (
	curObject = 0
	oldObject = 1
)
