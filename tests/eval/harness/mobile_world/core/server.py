# Pinned: src/mobile_world/core/server.py, Tongyi-MAI/MobileWorld @ 34e6a58d: the body of the /step
# route verbatim, as a function of the request and the device's controller (the FastAPI app,
# ensure_controller and fastapi's HTTPException replaced by the local class below).
import time

from loguru import logger

from mobile_world.runtime.utils.models import (
    ANSWER,
    ASK_USER,
    CLICK,
    DOUBLE_TAP,
    DRAG,
    INPUT_TEXT,
    KEYBOARD_ENTER,
    LONG_PRESS,
    NAVIGATE_BACK,
    NAVIGATE_HOME,
    OPEN_APP,
    SCROLL,
    STATUS,
    SWIPE,
    UNKNOWN,
    WAIT,
    StepRequest,
)


class HTTPException(Exception):
    def __init__(self, status_code: int, detail: str):
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code, self.detail = status_code, detail


class AdbResponse:  # runtime/utils/helpers.py::AdbResponse, as far as step() reads it
    def __init__(self, output):
        self.output = output


def step(req: StepRequest, ctr):
    logger.info(f"[STEP] Request: device={req.device}, action={req.action}")

    try:
        action = req.action
        action_type = action.action_type

        if action_type == CLICK:
            x, y = int(action.x), int(action.y)
            logger.info(f"[STEP] Executing click at ({x}, {y})")
            ret = ctr.tap(x, y)

        elif action_type == SWIPE:
            direction = action.direction or "up"
            logger.info(
                f"[STEP] Executing swipe: x={action.x}, y={action.y}, direction={direction}"
            )
            ret = ctr.swipe(action.x, action.y, direction)

        elif action_type == INPUT_TEXT:
            text = action.text
            logger.info(f"[STEP] Executing text input: '{text}'")
            if text != "":
                ret = ctr.text(text)
            else:
                logger.warning("[STEP] Text input is empty, skipping")

        elif action_type == NAVIGATE_BACK:
            logger.info("[STEP] Executing back button")
            ret = ctr.back()

        elif action_type == NAVIGATE_HOME:
            logger.info("[STEP] Executing home button")
            ret = ctr.home()

        elif action_type == KEYBOARD_ENTER:
            logger.info("[STEP] Executing enter key")
            ret = ctr.enter()

        elif action_type == LONG_PRESS:
            x, y = int(action.x), int(action.y)
            logger.info(f"[STEP] Executing long_press at ({x}, {y})")
            ret = ctr.long_press(x, y, 1000)

        elif action_type == DOUBLE_TAP:
            x, y = int(action.x), int(action.y)
            logger.info(f"[STEP] Executing double_tap at ({x}, {y})")
            ret = ctr.double_tap(x, y)

        elif action_type == DRAG:
            start_x, start_y = int(action.start_x), int(action.start_y)
            end_x, end_y = int(action.end_x), int(action.end_y)
            logger.info(f"[STEP] Executing drag from ({start_x}, {start_y}) to ({end_x}, {end_y})")
            ret = ctr.drag(start_x, start_y, end_x, end_y)

        elif action_type == SCROLL:
            # Map scroll to swipe for compatibility
            if action.direction in ["left", "right"]:
                direction = action.direction
            else:
                # scroll direction is reversed compared to swipe
                direction = "down" if action.direction == "up" else "up"
            logger.info(
                f"[STEP] Executing scroll: direction={action.direction}; equivalent to swipe {direction}"
            )
            ret = ctr.swipe(None, None, direction)

        elif action_type == OPEN_APP:
            app_name = action.app_name
            logger.info(f"[STEP] Executing open_app: {app_name}")
            ret = ctr.launch_app(app_name)

        elif action_type == WAIT:
            logger.info("[STEP] Executing wait for 1 second")
            time.sleep(1.0)
            ret = "OK"

        elif action_type == ANSWER:
            text = action.text or ""
            logger.info(f"[STEP] Executing answer: '{text}'")
            ctr.answer(text)
            ret = "OK"

        elif action_type == STATUS:
            status = action.goal_status or "unknown"
            logger.info(f"[STEP] Executing status: {status}")
            ret = status

        elif action_type == ASK_USER:
            logger.info("[STEP] Executing ask_user")
            agent_question = action.text
            ret = ctr.ask_user(agent_question)

        elif action_type == UNKNOWN:
            logger.info("[STEP] Executing unknown action")
            ret = "UNKNOWN_ACTION"

        else:
            logger.error(f"[STEP] Unknown action: {action_type}")
            raise HTTPException(status_code=400, detail=f"unknown action: {action_type}")

        if isinstance(ret, AdbResponse):
            ret = ret.output
        else:
            ret = ret if ret is not None else "OK"
        response = {
            "device": req.device,
            "action": action,
            "result": ret,
        }
        logger.info(f"[STEP] Success: {response}")
        return response
    except KeyError as e:
        logger.error(f"[STEP] Missing parameter: {e}")
        raise HTTPException(status_code=400, detail=f"missing param: {e}")
    except Exception as e:
        logger.error(f"[STEP] Error executing action {action_type}: {str(e)}")
        raise HTTPException(status_code=500, detail=str(e))
