"""SQLite files with versioned schemas: open, create from the newest schema, upgrade in steps."""

from agentcall.db.engine import (
    OpenedDatabase,
    SchemaSet,
    durable_transaction,
    open_database,
    packaged_schema,
    transaction,
)

__all__ = [
    "OpenedDatabase",
    "SchemaSet",
    "durable_transaction",
    "open_database",
    "packaged_schema",
    "transaction",
]
