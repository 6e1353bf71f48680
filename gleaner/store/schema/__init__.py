"""The schema: the ORM base and models, the pipeline's records, the Core tables the reads
use, dialect SQL, and bringing a new database file to the newest revision (the Alembic
revisions themselves are ``gleaner/store/migrations``)."""
