-- The name of the token a worker connected with (NULL: auth off): a worker id is its token's, and
-- a stream with another token may not take it over while it is connected or runs attempts
-- (upsert_worker). Adding a column without a default rewrites nothing.

ALTER TABLE lowtide.workers ADD COLUMN token_name text;
