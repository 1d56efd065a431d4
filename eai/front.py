"""The WSGI front: `POST /v1/tools/{name}/invoke` without Django's handler chain.

Django's handler and middleware chain cost ~0.1 ms of CPU a request on the bench
machine, a tenth of the gateway's whole share of an invoke. For the one hot route this
front does what that chain would do, by calling the same pieces directly: the request
id, the signals that manage database connections, the body limit, the locale, the
security, common and clickjacking headers, and Django's conversion of an exception to
a response. Everything else goes to Django unchanged, and so does every invoke for
which the chain would do more than pass it through: a body over the limit, a host not
allowed, an HTTPS redirect, a blocked user agent, a script prefix. The view is the
same `InvokeView` the URLconf routes to. `tests/test_front.py` sends the same requests
both ways and checks that the answers are identical.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core import signals
from django.core.exceptions import DisallowedHost
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler, WSGIRequest
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.locale import LocaleMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import resolve, set_script_prefix
from django.utils.log import log_response

from eai.middleware import new_request_id

# The `str` converter of `path("tools/<str:name>/invoke")` under `path("v1/", ...)`.
_INVOKE = re.compile(r"/v1/tools/([^/]+)/invoke")


def _no_response(request: HttpRequest) -> HttpResponse:
    raise AssertionError("the front calls the middleware hooks itself")


class Front:
    """A WSGI application: the invoke route served here, the rest by `django_app`."""

    def __init__(self, django_app: WSGIHandler) -> None:
        self.django_app = django_app
        self.security = SecurityMiddleware(_no_response)
        self.locale = LocaleMiddleware(_no_response)
        self.common = CommonMiddleware(_no_response)
        self.xframe = XFrameOptionsMiddleware(_no_response)
        self.view: Callable[..., HttpResponse] | None = None
        self.serve = convert_exception_to_response(self._view)

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        match = _INVOKE.fullmatch(environ.get("PATH_INFO", ""))
        if (
            match is None
            or environ.get("REQUEST_METHOD") != "POST"
            or environ.get("SCRIPT_NAME")
            or settings.FORCE_SCRIPT_NAME is not None
            or settings.DISALLOWED_USER_AGENTS
            or settings.PREPEND_WWW
            or not _within_limit(environ.get("CONTENT_LENGTH"))
        ):
            return self.django_app(environ, start_response)
        request = WSGIRequest(environ)
        try:
            request.get_host()
        except DisallowedHost:
            return self.django_app(environ, start_response)
        if self.security.process_request(request) is not None:
            return self.django_app(environ, start_response)  # the HTTPS redirect
        set_script_prefix("/")
        signals.request_started.send(sender=WSGIHandler, environ=environ)
        request.request_id = new_request_id()
        request.invoke_tool = match[1]
        self.locale.process_request(request)
        response = self.serve(request)
        response._resource_closers.append(request.close)
        # The chain's response hooks, innermost first, as Django runs them.
        response = self.xframe.process_response(request, response)
        response = self.common.process_response(request, response)
        response = self.locale.process_response(request, response)
        response = self.security.process_response(request, response)
        response["X-Request-Id"] = request.request_id
        if response.status_code >= 400:
            log_response(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request
            )
        response._handler_class = WSGIHandler  # its close() sends request_finished
        headers = [
            *response.items(),
            *(("Set-Cookie", c.output(header="")) for c in response.cookies.values()),
        ]
        start_response(f"{response.status_code} {response.reason_phrase}", headers)
        return response

    def _view(self, request: HttpRequest) -> HttpResponse:
        if self.view is None:
            # The view the URLconf routes to, so both ways run the same code.
            self.view = resolve("/v1/tools/_/invoke").func
        response = self.view(request, name=request.invoke_tool)
        if hasattr(response, "render") and callable(response.render):
            response = response.render()  # DRF's answers render late, as in Django
        return response


def _within_limit(length: str | None) -> bool:
    """Whether BodySizeLimitMiddleware would let the body through."""
    try:
        return int(length or 0) <= settings.EAI_MAX_REQUEST_BYTES
    except ValueError:
        return True
