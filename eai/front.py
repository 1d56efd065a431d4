"""The WSGI front: `POST /v1/tools/{name}/invoke` and `POST /v1/mcp` (MCP's door to the
same pipeline) without Django's handler chain.

Django's handler and middleware chain cost ~0.1 ms of CPU a request on the bench
machine, a tenth of the gateway's whole share of an invoke. For the hot routes this
front does what that chain would do, by calling the same pieces directly: Django's
resolver and path decoding, the request id, the signals that manage database
connections, the locale, the security, common and clickjacking headers, and Django's
conversion of an exception to a response. Everything else goes to Django with its
environ untouched, and so does every invoke for which the chain would do more than
pass it through: a body over the limit, a host not allowed, an HTTPS redirect, a
blocked user agent, a script prefix, a CSRF cookie. `tests/test_front.py` sends the
same requests both ways and checks that the answers are identical.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core import signals
from django.core.exceptions import DisallowedHost
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler, WSGIRequest, get_path_info
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.locale import LocaleMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import Resolver404, resolve, set_script_prefix, set_urlconf
from django.utils.log import log_response

from eai.middleware import (
    buffer_chunked_body,
    declared_length,
    holds_nul,
    new_request_id,
    read_declared_body,
    short_body,
    too_slow,
    wsgi_error,
)
from gateway.views import InvokeView, mcp_view


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
        self.serve = convert_exception_to_response(_view)

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        try:
            buffer_chunked_body(environ)  # every route: Django reads no body without a length
            if not read_declared_body(environ):
                return wsgi_error(environ, start_response, short_body())
        except TimeoutError:  # past the body's deadline (eai.workers.DeadlineUnreader)
            return wsgi_error(environ, start_response, too_slow())
        request = self._request(environ)
        if request is None:
            return self.django_app(environ, start_response)
        set_script_prefix("/")
        signals.request_started.send(sender=WSGIHandler, environ=environ)
        set_urlconf(settings.ROOT_URLCONF)
        request.request_id = new_request_id()
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

    def _request(self, environ: dict[str, Any]) -> WSGIRequest | None:
        """The request, when it is an invoke the chain would only pass through; else
        None, with `environ` as it came (WSGIRequest rewrites the one it is given)."""
        path = get_path_info(environ)  # decoded as Django decodes it
        if (
            environ.get("REQUEST_METHOD") != "POST"
            or not (
                path == "/v1/mcp" or (path.startswith("/v1/tools/") and path.endswith("/invoke"))
            )
            or environ.get("SCRIPT_NAME")
            or settings.FORCE_SCRIPT_NAME is not None
            or settings.DISALLOWED_USER_AGENTS
            or settings.PREPEND_WWW
            or settings.CSRF_COOKIE_NAME in environ.get("HTTP_COOKIE", "")
            or declared_length(environ) > settings.EAI_MAX_REQUEST_BYTES
            or environ.get("HTTP_CONTENT_ENCODING")
            or holds_nul(environ)  # refused by NulRefusalMiddleware
        ):
            return None
        try:
            # Django's own routing: a path another route takes first stays with Django.
            match = resolve(path)
        except Resolver404:
            return None
        if getattr(match.func, "view_class", None) is not InvokeView and match.func is not mcp_view:
            return None
        request = WSGIRequest(dict(environ))
        try:
            request.get_host()
        except DisallowedHost:
            return None
        if self.security.process_request(request) is not None:
            return None  # the HTTPS redirect
        request.resolver_match = match
        return request


def _view(request: HttpRequest) -> HttpResponse:
    match = request.resolver_match
    response = match.func(request, *match.args, **match.kwargs)
    if hasattr(response, "render") and callable(response.render):
        response = response.render()  # DRF's answers render late, as in Django
    return response
