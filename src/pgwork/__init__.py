"""pgwork: durable background jobs and job chains in PostgreSQL."""
