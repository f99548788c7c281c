module hiloop.local/tools/cni

go 1.26.8

require github.com/containernetworking/plugins v1.10.0 // indirect
