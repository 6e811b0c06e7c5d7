"""The plan cache: ``store`` over an SQLite file (``sqlite``, the embedded default) or a
PostgreSQL database (``postgres``), with one SQL text for both (``sql``)."""
