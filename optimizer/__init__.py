"""The compiler core, pure Python and no GPU: the fusion IR (``ir``), its analyses
(``analysis``), segment kinds and their rules (``kinds``), the segmenters (``segmenters``) and the
plan they all return (``plan``); ``planner.make_plan`` ties them together."""
