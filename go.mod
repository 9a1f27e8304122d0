module github.com/sluice-go/sluice

go 1.26

require (
	go.uber.org/goleak v1.3.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
