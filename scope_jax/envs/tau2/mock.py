"""The mock domain: a task list (agent side) and a notification inbox (user side), tau2-bench's test domain.

Agent tools: create_task, get_users, update_task_status (any status string is accepted, as in
tau2-bench), transfer_to_human_agents; helpers for assertions: assert_number_of_tasks, assert_task_status.
User tools: check_notifications, dismiss_notification; helpers: add_notification,
assert_notification_status. The domain has no quirk switch.
"""

from __future__ import annotations

from scope_jax.envs.tau2.db import Record
from scope_jax.envs.tau2.toolkit import GENERIC, READ, WRITE, Toolkit, helper, tool

AGENT_TABLES = ("tasks", "users")
USER_TABLES = ("notifications",)
TASK = ("task_id", "title", "description", "status")
USER = ("user_id", "name", "tasks")
NOTIFICATION = ("notification_id", "message", "status", "task_id")
DEFAULTS = {"description": None, "status": "unread", "task_id": None}  # optional fields of the records


FIELDS = {"tasks": (TASK, "task"), "users": (USER, "user"), "notifications": (NOTIFICATION, "notification")}


def normalize_record(table: str, record: Record) -> Record:
    """A record of a mock table (agent or user side) in field order, defaults filled in."""
    fields, what = FIELDS[table]
    missing = [f for f in fields if f not in record and f not in DEFAULTS]
    if missing:
        raise ValueError(f"a {what} record lacks {', '.join(missing)}")
    return {f: record.get(f, DEFAULTS.get(f)) for f in fields}


class MockTools(Toolkit):
    """The mock agent's tools."""

    def _task(self, task_id: str) -> Record:
        if self.db.get("tasks", task_id) is None:
            raise ValueError(f"Task {task_id} not found")
        return self.db.get("tasks", task_id)

    def _user(self, user_id: str) -> Record:
        if self.db.get("users", user_id) is None:
            raise ValueError(f"User {user_id} not found")
        return self.db.get("users", user_id)

    @tool(WRITE)
    def create_task(self, user_id: str, title: str, description: str | None = None) -> Record:
        """Create a new task for a user.

        Args:
            user_id: The id of the user who owns the task, e.g. 'user_1'.
            title: The task's title.
            description: An optional description of the task.
        """
        self._user(user_id)
        task_id = f"task_{len(self.db.table('tasks')) + 1}"
        task = {"task_id": task_id, "title": title, "description": description, "status": "pending"}
        self.db.insert("tasks", task_id, task)
        self.db.writable("users", user_id)["tasks"].append(task_id)
        return task

    @tool(READ)
    def get_users(self) -> list[Record]:
        """Get all users with the ids of their tasks."""
        return list(self.db.table("users").values())

    @tool(WRITE)
    def update_task_status(self, task_id: str, status: str) -> Record:
        """Set the status of a task.

        Args:
            task_id: The task id, e.g. 'task_1'.
            status: The new status: 'pending' or 'completed'.
        """
        self._task(task_id)
        task = self.db.writable("tasks", task_id)
        task["status"] = status
        return task

    @tool(GENERIC)
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent, with a summary of their issue.

        Args:
            summary: A summary of the user's issue.
        """
        return "Transfer successful"

    @helper
    def assert_number_of_tasks(self, user_id: str, expected_number: int) -> bool:
        return len(self._user(user_id)["tasks"]) == expected_number

    @helper
    def assert_task_status(self, task_id: str, expected_status: str) -> bool:
        return self._task(task_id)["status"] == expected_status


class MockUserTools(Toolkit):
    """The mock user's tools (on the user's own device)."""

    def _notification(self, notification_id: str) -> Record:
        if self.db.get("notifications", notification_id) is None:
            raise ValueError(f"Notification {notification_id} not found")
        return self.db.get("notifications", notification_id)

    @tool(READ)
    def check_notifications(self) -> list[Record]:
        """Show all notifications in your inbox."""
        return list(self.db.table("notifications").values())

    @tool(WRITE)
    def dismiss_notification(self, notification_id: str) -> str:
        """Mark a notification as read.

        Args:
            notification_id: The notification id, e.g. 'notif_1'.
        """
        self._notification(notification_id)
        self.db.writable("notifications", notification_id)["status"] = "read"
        return f"Notification {notification_id} dismissed"

    @helper
    def add_notification(self, notification_id: str, message: str, task_id: str | None = None) -> Record:
        notification = {"notification_id": notification_id, "message": message, "status": "unread",
                        "task_id": task_id}
        self.db.insert("notifications", notification_id, notification)
        return notification

    @helper
    def assert_notification_status(self, notification_id: str, expected_status: str) -> bool:
        return self._notification(notification_id)["status"] == expected_status
