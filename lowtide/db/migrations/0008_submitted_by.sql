-- Who submitted a task (the token's name), so a submitter may cancel only its own tasks.

ALTER TABLE lowtide.tasks ADD COLUMN submitted_by text;
