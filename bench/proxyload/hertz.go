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

// hertzFloor serves listen on hertz with the fasthttp floor's fixed 429
// (the same status, fields and body), nothing decided.
func hertzFloor(listen string) {
	hlog.SetLevel(hlog.LevelError)
	body := []byte(floorBody)
	h := server.New(server.WithHostPorts(listen), server.WithDisablePrintRoute(true))
	h.NoRoute(func(ctx context.Context, c *app.RequestContext) {
		c.Response.Header.Set("Retry-After", "1")
		c.Response.Header.Set("Ratelimit-Policy", `"request-rate";q=100;w=1;sluice-burst=1`)
		c.Response.Header.Set("Ratelimit", `"request-rate";r=0;t=1`)
		c.Response.Header.Set("X-Request-Id", "0000000-1")
		c.Response.Header.Set("Cache-Control", "no-store")
		c.Response.Header.SetContentType("application/json")
		c.Response.SetStatusCode(http.StatusTooManyRequests)
		c.Response.SetBody(body)
	})
	h.Spin()
}
