"""Request and response models, one module per resource: the HTTP contract (the OpenAPI
document is generated from these).

Requests (``_Request``) forbid unknown fields and are strict; every field documents units
and limits. Response families per resource: ``XCreate`` -> ``XPublic`` /
``XsPublic(data, count)``. Schemas import nothing from services or the database.
"""
