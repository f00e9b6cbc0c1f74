"""A tool whose parameters are a pydantic model's fields, so its input schema is that model.

FastMCP builds a tool's input schema and validation from the function's signature (`inspect.signature`,
which honours `__signature__`), and publishes a flat object, one property per parameter. `takes_model`
gives the tool a generated signature: `ctx`, then one keyword-only parameter per field, annotated with
the field's type, constraints and description, defaulting to the field's default. The body is called
with the context and the arguments as one model instance. The model stays the one place the parameters
are written (jobs/request.py for ask_team).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar, get_type_hints

from fastmcp import Context
from pydantic import BaseModel, Field

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")


def takes_model(
    model: type[M],
) -> Callable[[Callable[[Context, M], Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Decorate `async def tool(ctx, arguments: model) -> R` into a tool taking `model`'s fields."""

    def decorate(body: Callable[[Context, M], Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        returns = get_type_hints(body)["return"]  # resolved: FastMCP reads the output schema from it
        parameters = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Context)]
        for name, field in model.model_fields.items():
            # the annotation is built at run time, so mypy cannot read it as a type
            annotation = Annotated[field.annotation, *field.metadata, Field(description=field.description)]  # type: ignore[name-defined]
            default = inspect.Parameter.empty if field.is_required() else field.default
            keyword = inspect.Parameter.KEYWORD_ONLY
            parameters.append(inspect.Parameter(name, keyword, default=default, annotation=annotation))

        @functools.wraps(body)
        async def tool(ctx: Context, **arguments: Any) -> R:
            return await body(ctx, model(**arguments))

        tool.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
        tool.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
        del tool.__wrapped__  # the signature is the generated one, not body's
        return tool

    return decorate
