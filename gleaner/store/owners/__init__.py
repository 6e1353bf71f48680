"""An owner's data as a whole: the JSON Lines export and its restore, forgetting an owner,
forgetting one conversation."""
