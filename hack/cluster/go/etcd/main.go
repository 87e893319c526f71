// Command etcd runs etcd's own server entrypoint; the wrapper exists only to pin versions.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
