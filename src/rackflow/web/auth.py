"""Who is calling over HTTP: the gRPC rule (`rackflow.api.auth.authenticate`) applied to an HTTP request.

The token is read from `Authorization: Bearer …`; under mutual TLS the client certificate's subject CN is
published by the HTTP protocol (`rackflow.web.server`) in the request's state. Reading a page needs any
valid principal (every role may read); what an API call needs is the role of its RPC (`authorize`).
"""

from __future__ import annotations

from starlette.requests import HTTPConnection

from rackflow.api.auth import authenticate, bearer_token
from rackflow.security import Principal, TokenTable

CLIENT_CERTIFICATE_NAME = "rackflow_client_certificate_name"


def principal_of(request: HTTPConnection, tokens: TokenTable | None) -> Principal:
    """The caller's principal; `Unauthenticated` when tokens are configured and none valid is sent."""
    certificate_name = getattr(request.state, CLIENT_CERTIFICATE_NAME, None)
    return authenticate(tokens, bearer_token(list(request.headers.items())), certificate_name)
