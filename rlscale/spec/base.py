"""The spec models' common base and field types (models.py and algorithm.py build on them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    # allow_inf_nan: no field takes NaN or infinity (YAML .nan, .inf, or the strings "nan", "inf"): the API
    # server cannot store them and the planner's arithmetic breaks on them.
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=False, allow_inf_nan=False
    )


Auto = Literal["auto"]
PosInt = Annotated[int, Field(gt=0, strict=True)]  # strict: YAML `true` is not 1
