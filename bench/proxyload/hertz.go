package main

import (
	"context"
	"log"
	"net/http"

	"github.com/cloudwego/hertz/pkg/app"
	"github.com/cloudwego/hertz/pkg/app/client"
	"github.com/cloudwego/hertz/pkg/app/server"
	hlog "github.com/cloudwego/hertz/pkg/common/hlog"
)

// hertzProxy serves listen as a bare reverse proxy to upstream on hertz:
// each request sent on as it came, with X-Forwarded-For, over hertz's
// client and its pool of kept-alive connections; 502 when the upstream
// cannot be reached.
func hertzProxy(listen, upstream string) {
	hlog.SetLevel(hlog.LevelError)
	cli, err := client.NewClient(client.WithMaxConnsPerHost(4096))
	if err != nil {
		log.Fatal(err)
	}
	h := server.New(server.WithHostPorts(listen), server.WithDisablePrintRoute(true))
	h.NoRoute(func(ctx context.Context, c *app.RequestContext) {
		req := &c.Request
		req.URI().SetScheme("http")
		req.URI().SetHost(upstream)
		req.SetHost(upstream)
		req.Header.Set("X-Forwarded-For", c.ClientIP())
		if err := cli.Do(ctx, req, &c.Response); err != nil {
			c.AbortWithStatus(http.StatusBadGateway)
		}
	})
	h.Spin()
}
