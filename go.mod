module github.com/ckptplan/ckptplan

go 1.26.8

require (
	github.com/google/go-cmp v0.7.0
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sys v0.49.0
	gonum.org/v1/gonum v0.17.0
)
