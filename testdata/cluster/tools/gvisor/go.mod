module hiloop.local/tools/gvisor

go 1.26.3

require gvisor.dev/gvisor v0.0.0-20260905035102-160fafc42237 // indirect
