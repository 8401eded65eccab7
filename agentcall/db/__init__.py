"""SQLite files with versioned schemas: open, create from the newest schema, upgrade in steps."""

from agentcall.db.engine import (
    OpenedDatabase,
    SchemaSet,
    open_database,
    packaged_schema,
    transaction,
)

__all__ = ["OpenedDatabase", "SchemaSet", "open_database", "packaged_schema", "transaction"]
