-- 0004: the members of agentgate clusters (cluster mode's membership, see Store.Heartbeat).
-- A member's row lives while it renews heartbeat_at; the database's clock alone judges
-- expiry, so members with skewed clocks agree on who is alive.
CREATE TABLE members (
    cluster      TEXT        NOT NULL,
    id           TEXT        NOT NULL,
    host         TEXT        NOT NULL,
    port         INTEGER     NOT NULL,
    kinds        TEXT[]      NOT NULL DEFAULT '{}',
    joined_at    TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (cluster, id)
);
