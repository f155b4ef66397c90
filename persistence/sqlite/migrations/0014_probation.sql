-- 0014: the run in which a suspect message last began to run on probation (MarkProbation,
-- persistence.ProbationAfter): a message already counted against twice runs alone among such
-- messages, marked with its daemon run first, and Store.BeginRun counts a further unclean stop
-- against it only when that run is the one that died. '' when never marked.
ALTER TABLE messages ADD COLUMN probation_run TEXT NOT NULL DEFAULT '';
