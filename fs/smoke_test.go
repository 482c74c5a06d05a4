package fs

import (
	"os"
	"testing"

	"github.com/kvfs/kvfs/layout"
)

func TestSmoke(t *testing.T) {
	e := mountEnv(t, 8, Options{})
	k := layout.Key{Block: 0xabc, Layer: 1, Head: 1, Kind: layout.V}
	data := e.put(k)
	got, err := os.ReadFile(e.path(k))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(data[k]) {
		t.Fatal("mismatch")
	}
	ents, _ := os.ReadDir(e.dir)
	for _, x := range ents {
		t.Log(x.Name())
	}
}
