package client

import (
	"fmt"
	"strconv"
)

func fmtSscan(s string, v *float64) (int, error) { return fmt.Sscan(s, v) }

func itoa(n int) string { return strconv.Itoa(n) }
