package http

import (
	"net"
	"sync"
)

// countingListener counts the connections it accepts while they are open, for
// Config.ConnectionsOpen and ConnectionsLimitReached. It sits inside netutil.LimitListener, whose
// connections close it before they give their place back: the count never exceeds the limit,
// and reaches it only when every place is taken.
type countingListener struct {
	net.Listener
	p *Platform
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	p := l.p
	if p.conns.Add(1) == int64(p.cfg.MaxConnections) && p.cfg.ConnectionsLimitReached != nil {
		p.cfg.ConnectionsLimitReached.Inc()
	}
	if p.cfg.ConnectionsOpen != nil {
		p.cfg.ConnectionsOpen.Inc()
	}
	return &countedConn{Conn: c, p: p}, nil
}

// countedConn is a connection of countingListener; the server may close it more than once.
type countedConn struct {
	net.Conn
	p      *Platform
	closed sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.closed.Do(func() {
		c.p.conns.Add(-1)
		if c.p.cfg.ConnectionsOpen != nil {
			c.p.cfg.ConnectionsOpen.Dec()
		}
	})
	return err
}
