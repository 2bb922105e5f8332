"""A tenant's own knowledge: documents, their chunks, importers and the per-tenant index port.

Importers (`importers`) turn files into `Document`s; `chunking` cuts documents into passages with
stable ids (document id + position); a `KnowledgeIndex` adapter (`indexes`) keeps one index per
tenant current; `service.KnowledgeBaseService` is the use case the gRPC service and the CLI call.
"""
