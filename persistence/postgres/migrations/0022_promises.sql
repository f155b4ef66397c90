-- 0022: a key's holder that another member cannot reach, though both reach the database, hands
-- its claim over to that member here (Store.Promise). The member that asks records its ask in
-- release_asks (Store.ExchangeAsks), and the member the store names as the key's holder (the
-- owner of its latest claim) reads the asks addressed to it there. While it holds nothing of
-- the key it promises its claim, at its epoch, to the asker: owner becomes the asker's node, so
-- that every member's lookup of the key's holder (Store.Holders, an older member's too) names
-- the asker, and promised_by keeps the node that made the claim, valid while promised_epoch is
-- the row's epoch (the next claim raises the epoch, whichever member's version makes it).
ALTER TABLE owners ADD COLUMN promised_by TEXT NOT NULL DEFAULT '';
ALTER TABLE owners ADD COLUMN promised_epoch BIGINT NOT NULL DEFAULT 0;
CREATE TABLE release_asks (
    cluster  TEXT        NOT NULL,
    key      TEXT        NOT NULL,
    asker    TEXT        NOT NULL,
    asked_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (cluster, key, asker)
);
