// Command etcd is upstream's etcd server, unchanged: `go install go.etcd.io/etcd/server/v3@v3.5.21` is
// refused because that module's go.mod has replace directives, so this wrapper module requires it and
// calls its entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
