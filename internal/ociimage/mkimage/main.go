// Command mkimage writes the OCI image archives of the webhook and the
// audit sink (make images): static binaries, non-root, with CA
// certificates, tagged as the chart's image defaults expect.
//
//	go run ./internal/ociimage/mkimage -out bin/images [-version V] [-registry R] [-arch A]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/stampguard/stampguard/internal/ociimage"
)

func main() {
	var o ociimage.BuildOptions
	flag.StringVar(&o.OutDir, "out", "bin/images", "`directory` for the archives")
	flag.StringVar(&o.Version, "version", "", "image tag (default the chart's appVersion)")
	flag.StringVar(&o.Registry, "registry", ociimage.DefaultRegistry, "`registry/namespace` of the image names")
	flag.StringVar(&o.Arch, "arch", "", "GOARCH (default this machine's)")
	flag.StringVar(&o.CACertificates, "ca-certificates", ociimage.DefaultCACertificates, "PEM `file` of CA certificates to install")
	flag.StringVar(&o.Revision, "revision", "", "commit for the org.opencontainers.image.revision label")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mkimage: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	o.RepoRoot = "."
	paths, err := ociimage.Build(context.Background(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	for _, p := range paths {
		fmt.Println(p)
	}
}
