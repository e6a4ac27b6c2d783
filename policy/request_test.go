package policy

import (
	"reflect"
	"testing"
)

func TestDecodeUserInfo(t *testing.T) {
	cases := map[string]UserInfo{
		`null`: {},
		`{}`:   {},
		`{"username":"alice","uid":"1","groups":["dev","system:authenticated"],"extra":{"k":["v"]}}`: {Name: "alice", Groups: []string{"dev", "system:authenticated"}},
		`{"username":"bob","groups":null}`: {Name: "bob"},
	}
	for in, want := range cases {
		got, err := DecodeUserInfo([]byte(in))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("DecodeUserInfo(%s) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{`"alice"`, `{"username":7}`, `{"groups":"dev"}`, `{"username":"a"`} {
		if _, err := DecodeUserInfo([]byte(bad)); err == nil {
			t.Errorf("DecodeUserInfo(%s) accepted", bad)
		}
	}
}

func TestResourceName(t *testing.T) {
	cases := map[string]Request{
		"configmaps":             {Resource: "configmaps"},
		"deployments.apps":       {Resource: "deployments", Group: "apps"},
		"deployments.apps/scale": {Resource: "deployments", Group: "apps", SubResource: "scale"},
		"pods/status":            {Resource: "pods", SubResource: "status"},
	}
	for want, r := range cases {
		if got := r.ResourceName(); got != want {
			t.Errorf("ResourceName of %+v = %q, want %q", r, got, want)
		}
	}
}
