from services.celery_app import app, configure
from services.core.settings import Settings


def test_reconfiguring_points_every_cached_client_at_the_new_redis():
    configure(Settings(redis_url="redis://127.0.0.1:6399/1"))
    assert app.pool.connection.as_uri().endswith("/1")
    _ = app.backend
    configure(Settings(redis_url="redis://127.0.0.1:6399/2"))
    assert app.pool.connection.as_uri().endswith("/2")
    assert app.amqp.producer_pool.connections.connection.as_uri().endswith("/2")
    assert app.backend.url.endswith("/2")
