"""What the routes under /api/v1 take from dependency injection (the providers are in
service/api/app.py and service/api/auth.py) and the path parameter they share, declared
once for every module of routes."""

from __future__ import annotations

from typing import Annotated

from litestar.di import NamedDependency
from litestar.params import Parameter

from service.api.handshake import Outbound
from service.api.metrics import ApiMetrics
from service.config import Settings
from service.crypto import SecretBox
from service.store import Store
from service.tokens import Principal

StoreDep = NamedDependency[Store]
PrincipalDep = NamedDependency[Principal]
ClientDep = NamedDependency[Outbound]
SettingsDep = NamedDependency[Settings]
BoxDep = NamedDependency[SecretBox]
MetricsDep = NamedDependency[ApiMetrics]

IdPath = Annotated[str, Parameter(description="subscription id (integer)")]
