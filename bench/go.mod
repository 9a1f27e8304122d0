module github.com/sluice-go/sluice/bench

go 1.26.0

require github.com/sluice-go/sluice v0.0.0

require golang.org/x/time v0.16.0

replace github.com/sluice-go/sluice => ../
